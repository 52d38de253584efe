"""``het data prepare``: raw data sets into het's memory-mappable format."""

from __future__ import annotations


def add_parser(sub) -> None:
    """Register ``het data prepare DATASET`` on the ``het`` command's subparsers."""
    from het.data.criteo import add_prepare_parser

    data = sub.add_parser("data", help="prepare data sets")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    prepare = data_sub.add_parser("prepare", help="turn raw data into het's memory-mappable format")
    add_prepare_parser(prepare.add_subparsers(dest="dataset", required=True))
