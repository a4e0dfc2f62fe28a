set -o pipefail
source .whl/setup.sh > $OUT/setup.log 2>&1 || { cat $OUT/setup.log; exit 1; }
python3 scripts/run_study.py --runs bf16,bf16_seed1,fp8,nvfp4 --out /tmp/res --work /tmp/study_runs --stop-after ${STOP:-470} --skip-steps 40 2>&1 | grep -v "tokenizing\|preparing" | tee $OUT/study.log
tar czf $OUT/res.tgz -C /tmp res
tar czf $OUT/work.tgz --exclude=checkpoints --exclude=.hydra -C /tmp study_runs
ls /tmp/study_runs/*/checkpoints
