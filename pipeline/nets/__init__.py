"""Networks and their training parts: backbones, what every method is (its hooks, its encoder),
optimizers and schedules, the fast path."""
