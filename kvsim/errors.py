"""User-facing errors: the CLI prints these as one line and exits with code 2.

Anything that is not a KvsimError is a bug in kvsim and keeps its traceback.
"""


class KvsimError(Exception):
    """Bad input from the user: a file, field, name or number that kvsim cannot accept."""


class UnknownNameError(KvsimError):
    """A name (model, trace, policy, profile) that no registry knows."""

    def __init__(self, kind: str, name: str, valid: list[str]) -> None:
        self.kind, self.name, self.valid = kind, name, sorted(valid)
        super().__init__(f"unknown {kind} {name!r}; valid: {', '.join(self.valid)}")


class ConfigError(KvsimError):
    """A configuration value or file that is impossible or malformed."""


class TraceError(KvsimError):
    """A trace file or row that does not match its format."""


class PluginError(KvsimError):
    """A third-party plugin raised: reported as the plugin's fault, not kvsim's."""
