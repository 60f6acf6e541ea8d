"""pipeline.methods.ema_check: the key encoder check needs two recorded steps."""

from test_moco import tiny_model


def test_key_encoder_check_needs_two_recorded_steps():
    import math

    from pipeline.methods.ema_check import EmaRecord

    record = EmaRecord(tiny_model())
    steps, error = record.replay_error()
    assert steps == 0 and math.isnan(error)
    record.before_step()
    steps, error = record.replay_error()
    assert steps == 0 and math.isnan(error)
