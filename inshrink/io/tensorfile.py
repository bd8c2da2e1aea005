"""The names of the Writer and the File, from the modules that define them (the module the
rest of the library imports them from for now; new code imports those modules)."""
from ..codecs.chain import pipeline_for
from .arguments import Progress, check_progress, resolve_threads
from .file import File
from .info import ERROR_FIELDS, TensorInfo
from .writer import DEFAULT_CHUNK_BYTES, TINY_TENSOR_BYTES, Writer, file_minor

__all__ = ["DEFAULT_CHUNK_BYTES", "ERROR_FIELDS", "TINY_TENSOR_BYTES", "File", "Progress",
           "TensorInfo", "Writer", "check_progress", "file_minor", "pipeline_for",
           "resolve_threads"]
