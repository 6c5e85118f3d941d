from tune_as.report.cli import cli

cli()
