"""The study's report, drawn from its runs file alone: stats, findings, tables, sweeps, figures,
prose."""
