"""What the tests share: repositories, servers, models and harnesses made for them, imported as
`tests.helpers.<module>` (scripts among them are run by their path, `HELPERS / "name.py"`)."""
