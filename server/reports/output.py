"""The output folder of a report or export: new or empty, never silently overwritten."""

from __future__ import annotations

from pathlib import Path

from geofl.server.reports.errors import ReportError

__all__ = ["check_output_folder", "prepare_output_folder"]


def check_output_folder(folder: Path) -> None:
    """Refuse ``folder`` unless it is missing or an empty folder.

    Refusing a non-empty folder keeps a second report from mixing its files with an
    earlier one's, or overwriting files the user kept there.

    Raises
    ------
    ReportError
        ``folder`` is a file, or a folder that already holds something.
    """
    if folder.exists() and not folder.is_dir():
        raise ReportError(f"output path {folder} exists and is not a folder")
    if folder.is_dir() and any(folder.iterdir()):
        raise ReportError(
            f"output folder {folder} is not empty; give a new or empty folder "
            "(nothing is overwritten)"
        )


def prepare_output_folder(folder: Path) -> Path:
    """Check ``folder`` as :func:`check_output_folder` does, then create it (and parents).

    Raises
    ------
    ReportError
        ``folder`` is a file, or a folder that already holds something.
    """
    check_output_folder(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return folder
