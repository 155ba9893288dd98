"""The torch-free core both sides share: frames (wire), tree geometry, acceptance, picks
(sampling), the export manifest, auth, typed errors, and the device / dtype decisions.

It imports nothing from any layer and no torch (pyproject's import-linter contracts hold that).
"""
