"""Layout test configuration. The shared builders and strategies live in
``layout_builders.py`` (a unique module name, unlike ``conftest``): import from there."""
