"""The experiments: configs (YAML folders) and the code that runs and reports them, in layers
(pyproject.toml [tool.importlinter], docs/design.md), each importing only those beneath it:

- the runners, run as files (``python experiments/study.py``, as the Makefile and the docs run
  them) or as modules (``python -m experiments.study``): ``study``, ``controls``, ``recodings``,
  ``demo``, ``rehearsal``, ``evaluate``;
- ``report``: the study's report, drawn from its runs file alone;
- ``plan``: what the runners run (the study's run names, stages and cost);
- ``launch``: the executor (local or SLURM), the fit of one run, a run's record (its resolved
  config's values), the runs file, the grid.

The project installs this package (editable), so a runner imports its siblings as
``experiments.launch.fit`` also when it runs as a file.
"""
