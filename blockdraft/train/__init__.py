"""Training DFlash drafters: block construction, objectives' driver, trainer."""
