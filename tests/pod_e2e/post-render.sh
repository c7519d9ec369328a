#!/usr/bin/env bash
# Helm post-renderer of the pod end-to-end test only (never a chart default): see service_env.py.
exec "${E2E_PYTHON:?set by tests/pod_e2e/conftest.py}" "$(dirname "$0")/service_env.py"
