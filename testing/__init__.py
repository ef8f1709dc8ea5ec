"""Test support that tests/ and bench/ share: a real `ithaca serve` process on loopback (server_process) and
the fake instant pipeline it can run (fake_pipeline). Not installed: used from a checkout."""
