"""Errors a user can act on; the CLI prints their message on one line and exits with `exit_code`."""

from __future__ import annotations


class PipeschedError(Exception):
    """Base of the errors that reach the user as one line."""

    exit_code = 2

    def __reduce__(self):
        # Rebuilt from the message and the attributes, whatever the subclass's __init__
        # takes: errors cross processes (a process pool, the ranks' reports).
        return (_rebuilt, (type(self), self.args, self.__dict__))


def _rebuilt(cls: type[PipeschedError], args: tuple, state: dict) -> PipeschedError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class InputError(PipeschedError):
    """Bad input: a file, a field or an option the user gave (exit 2)."""

    exit_code = 2


class InfeasibleError(PipeschedError):
    """No schedule satisfies the problem, e.g. its memory limit (exit 3)."""

    exit_code = 3


class DeadlockError(PipeschedError):
    """An op order that can never finish; `blocked` holds each stuck device's next op."""

    exit_code = 1

    def __init__(self, message: str, blocked: dict[int, str]):
        super().__init__(message)
        self.blocked = blocked


class ScheduleError(PipeschedError):
    """A schedule that breaks the problem's rules (exit 1); `violations` lists them all."""

    exit_code = 1

    def __init__(self, source: str, violations: list[str]):
        shown = "; ".join(violations[:3]) + (f"; and {len(violations) - 3} more" if len(violations) > 3 else "")
        super().__init__(f"{source}: invalid schedule: {shown}")
        self.source = source
        self.violations = violations
