"""The floor every layer stands on, in the standard library only: how a config key is declared
(keys.py), the error a bad value raises (errors.py), and the lists and output paths every layer
names (layout.py). It imports nothing else of the package, so the config (pipeline.dag), the
methods (pipeline.methods) and the stages can all build on it without importing each other."""
