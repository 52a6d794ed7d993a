"""The toolkit's named errors. Every one derives from `ToyCircuitsError`, so the command line catches one class, and
each also from the built-in its meaning matches (`ValueError` for bad values), so `except ValueError` keeps working.
Free of torch imports: the command line reads them without loading a model.
"""


class ToyCircuitsError(Exception):
    """Base of every error this toolkit raises on purpose: the message names the problem and what is allowed."""


class ConfigError(ToyCircuitsError, ValueError):
    """An invalid configuration; the message names the field and the allowed values."""


class CheckpointError(ToyCircuitsError, ValueError):
    """A checkpoint that cannot be read: the message names the file and, where it applies, the tensor."""


class TokenizerError(ToyCircuitsError, ValueError):
    """A tokenizer file that cannot be used; the message names the file and the problem."""


class CorpusError(ToyCircuitsError, ValueError):
    """A corpus that cannot train a model (no files, no text, too few tokens); the message says why."""


class CorpusChecksumError(CorpusError):
    """A shipped corpus snapshot whose archive (or extracted text) does not match its manifest's sha256."""


class TrainConfigError(ToyCircuitsError, ValueError):
    """A training setting that cannot work; raised before any training starts."""


class InputError(ToyCircuitsError, ValueError):
    """Model input that cannot be used (token ids outside a vocabulary, a sequence longer than the model's positions,
    a mask of the wrong shape); the message names the argument and what is allowed."""


class TokenNotFoundError(InputError, AssertionError):
    """`get_token_position`: the token is not in the prompt. Its message is TransformerLens 2.x's ("The token does not
    occur in the prompt", which its tests compare), a note names the token; also an `AssertionError`, the type
    TransformerLens raises there."""


class WeightProcessingError(ToyCircuitsError, ValueError):
    """`process_weights_` (or a loader's processing flags) asked for a step that TransformerLens 2.18 refuses or that
    would change the model's outputs; the message names the step, the setting that blocks it and what to pass."""


class UnsupportedByTransformerLens(ToyCircuitsError, NotImplementedError):
    """The configuration has no exact TransformerLens 4.x counterpart, or the installed TransformerLens (3.x) lacks
    the feature; the message names the version that has it."""


class HookSwitchError(ConfigError, AssertionError):
    """An opt-in hook point used while its switch is off, or a switch this model cannot turn on. Also an
    `AssertionError`, the type TransformerLens 2.x raises there, so code written for it keeps working."""


class MissingDependencyError(ToyCircuitsError, ImportError):
    """An optional dependency is not installed; the message names the `pip install` that adds it."""


class SAEError(ToyCircuitsError, ValueError):
    """A sparse-autoencoder request that cannot work (a hook point with no activation of the right shape, an SAE
    folder made for another model); the message names the argument and what is allowed."""


class FolderError(ToyCircuitsError, ValueError):
    """A folder a command may not write (`models.io.run_folder`): another kind's or a foreign one, a member of a seed
    sweep, in use by a live process, or changed since it was written (a member missing, other settings, a corrupt
    file); the message names the folder and what to do, and nothing in it was changed."""


class DiskFullError(ToyCircuitsError, OSError):
    """The disk (or the user's quota) filled up while a folder was written (ENOSPC / EDQUOT): an error of the
    environment, not of the input (the command line exits 1). Nothing was published: the folder holds what it held
    before. `errno` is the original one."""


class ContextWindowWarning(UserWarning):
    """Text longer than the model's context: the model reads its last tokens only (one rule for every entry point
    that takes text: `to_tokens(truncate="last")`; the command line prints it as one line on stderr)."""
