"""One run on disk: its folder, its lock, the resume plan, the console."""
