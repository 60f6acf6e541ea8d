"""How a job runs: checkpoints and resume, CPUs, ranks, preemption, timing, atomic writes,
provenance, TensorBoard, the stages' log lines."""
