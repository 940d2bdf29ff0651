"""The pairs the app offers: the registry read from `pairs.json` (`registry.py`), and the loaded
pairs kept once each (`models.py`)."""
