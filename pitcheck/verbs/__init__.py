"""One user question each (compare, stress, bench, validate, heads, convert, plot), returning results and
raising PitcheckError; the CLI in pitcheck/cli prints them.

Nothing is imported here: each verb loads when it is asked for.
"""
