"""Step-level targets (``cliplab conform NAME --level step``): one module per trainer, each with a ``StepTarget``
(name, versions, how, step_checks()) that drives the trainer's own split, scaling and accumulation."""
