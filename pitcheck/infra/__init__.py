"""Mechanisms that know nothing of PIT: the error type, the crash-safe run directory, task executors, thread
pinning, progress lines, plotting set-up and JUnit files.

Nothing is imported here: `import pitcheck` imports infra.errors at start-up and must stay light.
"""
