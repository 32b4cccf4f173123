import sys

from fixed_embed.cli import main

sys.exit(main())
