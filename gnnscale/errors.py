"""User errors: each carries a fix-it hint; the CLI turns them into exit code 2 and one line."""


class GnnscaleError(Exception):
    """A problem with the user's input or config; never a bug in gnnscale."""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        text = self.message.rstrip(". ")
        if self.hint:
            text += f"; {self.hint.rstrip('. ')}"
        return " ".join(text.split())


class ConfigError(GnnscaleError):
    """An unknown key, a wrongly typed value or an inconsistent combination of settings."""


class DataError(GnnscaleError):
    """Input data that is missing, unreadable, malformed or inconsistent."""


class GraphDirError(DataError):
    """A graph_dir that is absent, incomplete, stale or fails its checksums."""


class MemoryBudgetError(ConfigError):
    """A run whose estimated memory exceeds its budget: refused before it could be killed mid-way."""


class RankFailedError(GnnscaleError):
    """A rank of a multi-process job died or failed: the job stopped (exit 1, or the rank's own code)."""

    def __init__(self, message: str, hint: str = "", exit_code: int = 1, reported: bool = False):
        super().__init__(message, hint)
        self.exit_code = exit_code
        self.reported = reported  # the rank printed its own one-line error already
