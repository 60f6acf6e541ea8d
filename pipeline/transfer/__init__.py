"""Detection transfer, the work behind the stage ``python -m pipeline.detect`` (which is only its
command line): the scenes as detector inputs (data), the detector over a pretrained backbone
(model), how the ranks share the batch and BatchNorm (ranks), fine-tuning (train), scoring a
split (evaluate), one trial from checkpoint to metrics JSON (trial) and a cell's trials as mean
and std (summary). ``log`` writes the stage's ``[detect]`` lines, on rank 0 only."""

from pipeline.runtime.stage_log import is_main_process, stage_log

log = stage_log("detect", when=is_main_process)  # no torch here: the summary job needs none
