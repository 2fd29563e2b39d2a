#!/bin/bash
# Seed 002's sbatch line as its document gives it, scaled to the local cluster: 2 nodes x 2 tasks, no GPUs,
# no account or partition; /scratch/$USER is $SCRATCH here.
sbatch --nodes=2 --ntasks-per-node=2 --cpus-per-task=1 \
       --output=$SCRATCH/out/slurm/slurm-%j.out \
       --container-image=$SCRATCH/home/containers/pytorch-23.10.sqsh \
       --no-container-mount-home --container-remap-root \
       --container-workdir=$SCRATCH/py-in-container/lit-gpt \
       --container-mounts=$SCRATCH/py-in-container/lit-gpt:$SCRATCH/py-in-container/lit-gpt,$SCRATCH/data:$SCRATCH/py-in-container/lit-gpt/data,$SCRATCH/out:$SCRATCH/py-in-container/lit-gpt/out \
       ./train-redpajama-prelaunch.sh
