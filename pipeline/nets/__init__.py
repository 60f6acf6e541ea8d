"""Networks and their training parts: backbones, the method registry's builders, optimizers and
schedules, the fast path."""
