"""The study runners and their configs: ``import experiments.study``, ``python -m experiments.study``.

Each runner also runs as a file (``python experiments/study.py``, as the Makefile and the docs run
it), so its imports of the other runners take the package form (``experiments.runs``) when it is
imported as part of the package and the plain one (``runs``) when it runs as a file: Python then
puts experiments/ itself on ``sys.path``, not the repository root.
"""
