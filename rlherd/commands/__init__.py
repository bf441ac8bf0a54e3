"""The commands of the ``rlherd`` CLI (``train``, ``eval``, ``collect``, ``plot``, ``check-env``):
the top floor, above agents and runtimes, which they name and put together."""
