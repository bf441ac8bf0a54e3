"""The commands of the ``rlherd`` CLI that are more than a call into the layers below."""
