from tune_as.search import cli

cli()
