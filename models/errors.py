"""The toolkit's named errors (kept free of torch imports, so the command line can catch them cheaply)."""


class ConfigError(ValueError):
    """An invalid configuration; the message names the field and the allowed values."""
