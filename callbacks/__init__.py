"""Lightning callbacks, one per file; configs name each by this package
(``callbacks.CheckpointPolicy``)."""

from fixed_embed.public_names import exports

_HOMES = {
    "BenchmarkCallback": "benchmarks",
    "CheckpointPolicy": "checkpointing",
    "FailFast": "fail_fast",
    "GradientMonitor": "gradients",
    "InputNormMonitor": "input_norm",
    "ParameterSummary": "model_summary",
    "PreemptionCheckpoint": "preemption",
    "UpdateProgressBar": "progress",
    "SpeedMonitor": "throughput",
}
__getattr__ = exports(__name__, _HOMES)
