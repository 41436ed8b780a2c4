"""Typed errors. Every message says what is wrong, where, and how to fix it.

The CLI maps any ``SftDataError`` to a red message and ``exit_code``; a traceback
reaching a user is a bug.
"""

from __future__ import annotations


class SftDataError(Exception):
    """Base class of every error sftdata raises on purpose."""

    exit_code = 1


class UsageError(SftDataError):
    """The command line or the arguments of a call are inconsistent."""

    exit_code = 2


class InputError(SftDataError):
    """An input file cannot be read at all (missing, unreadable, wrong container)."""


class RecordError(InputError):
    """One record of an input file is invalid.

    ``reason`` is a short stable code (``invalid_json``, ``unknown_role`` ...) used to
    count rejections; ``where`` is ``"file:line N"`` or ``"file:item N"``.
    """

    def __init__(self, reason: str, message: str, where: str = "", record: int | None = None):
        self.reason = reason
        self.detail = message
        self.where = where
        self.record = record
        super().__init__(f"{where}: {message}" if where else message)


class NoUsableRecordsError(InputError):
    """Every record of the input was rejected: an error, not an empty dataset."""


class TokenizerError(SftDataError):
    """The tokenizer cannot be built, or does not match what a dataset recorded."""


class TokenizerFailure(TokenizerError):
    """The tokenizers library failed on a text (its own error, or a Rust panic): the record
    is rejected as ``tokenizer_error``."""

    reason = "tokenizer_error"


class DatasetError(SftDataError):
    """A dataset on disk is missing, incomplete, inconsistent or corrupt."""


class OutputExistsError(SftDataError):
    """The output folder exists and ``--overwrite`` was not given."""


class ConfigError(SftDataError):
    """A loader/training config file or value is invalid."""


class TemplateError(SftDataError):
    """A chat template cannot be used: it does not compile, raises on a probe
    conversation, or renders assistant output that no mask rule can locate or stop.
    ``reason``: the code of a record it rejects."""

    reason = "template_error"


class TemplateLimitError(TemplateError):
    """A chat template ran past a limit of its render (steps, output, call depth, memory):
    the record is rejected as ``template_limit``, or the run refused when a probe did."""

    reason = "template_limit"


class AllRecordsRejectedError(NoUsableRecordsError):
    """Every record was rejected. ``rejects_path`` is where the reason for each record was
    written (a file beside the output folder, which is not created); ``rejected`` counts
    the records per reason."""

    def __init__(self, message: str, rejects_path: str | None = None, rejected: dict | None = None):
        super().__init__(message)
        self.rejects_path = rejects_path
        self.rejected = dict(rejected or {})


class NothingToTrainError(DatasetError):
    """A dataset (or the result a command would write) has no row, no episode or no trained
    token in its train split: training on it would learn nothing, so it is refused."""
