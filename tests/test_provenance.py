"""pipeline.runtime.provenance: the library versions a record states (tests/test_stats.py checks the
rest of the record)."""


def test_versions_of_a_missing_library_is_none(monkeypatch):
    from importlib import metadata

    from pipeline.runtime import provenance

    monkeypatch.setattr(provenance, "LIBRARIES", ("numpy", "no-such-distribution-here"))
    assert provenance.versions() == {"numpy": metadata.version("numpy"), "no-such-distribution-here": None}
