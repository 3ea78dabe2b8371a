"""Mixed precision helpers: ``GradScaler`` (dynamic loss scaling)."""
