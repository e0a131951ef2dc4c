#!/usr/bin/env bash
# Replaced by make-dynsec.py: the production broker now takes its accounts, their bound client ids and
# their roles from Mosquitto's dynamic-security plugin (see broker_config/README.md, "Users and roles").
echo "make-users.sh is replaced by broker_config/scripts/make-dynsec.py ROSTER.toml (see broker_config/README.md)" >&2
exit 2
