"""``het data prepare`` (raw data sets into het's memory-mappable format) and ``het data describe``."""

from __future__ import annotations


def add_parser(sub) -> None:
    """Register ``het data prepare DATASET`` on the ``het`` command's subparsers."""
    from het.data import criteo, stream_synthetic, table_cli

    data = sub.add_parser("data", help="describe and prepare data sets")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    prepare = data_sub.add_parser("prepare", help="turn raw data into het's memory-mappable format")
    datasets = prepare.add_subparsers(dest="dataset", required=True)
    criteo.add_prepare_parser(datasets)
    table_cli.add_prepare_parser(datasets)
    table_cli.add_describe_parser(data_sub)
    stream_synthetic.add_parser(data_sub)
