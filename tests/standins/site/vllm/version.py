__version__ = "0.33.0"
__version_tuple__ = (0, 33, 0)
