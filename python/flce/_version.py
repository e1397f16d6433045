"""The flce package's version: the library's too (CMakeLists.txt project(VERSION), flce_version());
python/check_layout.py checks the three agree. python/pyproject.toml reads it from here."""
__version__ = "0.1.0"
