"""The one exception type pitcheck raises for bad input; the CLI prints it as a one-line error."""


class PitcheckError(ValueError):
    pass
