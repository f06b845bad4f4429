"""The metrics stage: the catalogue of what is exported (catalogue), the counts (store) and
what the stages hand the store (inputs)."""
