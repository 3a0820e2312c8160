"""Files on local disks or object stores (s3://, gs://, abfs://, hdfs://) through pyarrow."""

from __future__ import annotations

import json
import os
from typing import Any

import pyarrow.fs as pafs


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem holding `uri` and the path within it; local paths are made absolute."""
    return pafs.FileSystem.from_uri(uri if "://" in uri else os.path.abspath(uri))


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


def write_json(uri: str, content: Any) -> None:
    """Write `content` as JSON so that readers see the whole file or none of it.

    Local files are written beside and renamed into place; object stores make a single
    PUT atomic already.
    """
    fs, path = filesystem(uri)
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    data = json.dumps(content).encode()
    if isinstance(fs, pafs.LocalFileSystem):
        temporary = f"{path}.tmp-{os.getpid()}"
        with fs.open_output_stream(temporary) as out:
            out.write(data)
        fs.move(temporary, path)
    else:
        with fs.open_output_stream(path) as out:
            out.write(data)


def read_json(uri: str) -> Any | None:
    """The JSON content of `uri`, or None when the file does not exist."""
    fs, path = filesystem(uri)
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return None
    with fs.open_input_stream(path) as stream:
        return json.loads(stream.read())


def delete_tree(uri: str) -> None:
    """Delete a file, or a directory and all below it; a missing one is fine."""
    fs, path = filesystem(uri)
    kind = fs.get_file_info(path).type
    if kind == pafs.FileType.Directory:
        fs.delete_dir(path)
    elif kind == pafs.FileType.File:
        fs.delete_file(path)


def list_names(uri: str) -> list[str]:
    """Names of the entries directly in directory `uri` (empty when it does not exist)."""
    fs, path = filesystem(uri)
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return []
    return [info.base_name for info in fs.get_file_info(pafs.FileSelector(path))]
