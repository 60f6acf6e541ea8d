"""The floor every layer stands on, in the standard library only: how a config key is declared
(keys.py), the error a bad value raises (errors.py), the lists and output paths every layer
names (layout.py), and which files of a folder are its images (folders.py: conversion and the
DAG's count of the training set apply the same rules). It imports nothing else of the package,
so the config (pipeline.dag), the methods (pipeline.methods) and the stages can all build on it
without importing each other."""
