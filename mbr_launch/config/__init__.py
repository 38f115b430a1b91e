"""Settings (each declared once), their pure parsers, the typed launch configuration and its validation."""
