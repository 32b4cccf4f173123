"""The study runners and their configs: ``import experiments.study``, ``python -m
experiments.study``.

The project installs this package (editable), so a runner imports its siblings as
``experiments.runs`` also when it runs as a file (``python experiments/study.py``, as the
Makefile and the docs run it).
"""
