#!/usr/bin/env bash
# A worker joins with the command the control plane left in the synced folder.
set -euxo pipefail
bash /kube-nft/target/join.sh --ignore-preflight-errors=FileExisting-iptables
