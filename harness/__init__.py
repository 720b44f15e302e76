"""The cliplab command line, differential checks between the layers, configs and reports."""
