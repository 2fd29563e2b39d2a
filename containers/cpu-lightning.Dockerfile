# kit's CPU PyTorch Lightning image as a Dockerfile: the same steps as cpu-lightning.toml,
# and the same image (tests/test_containers.py compares the two).
#   kit build containers -f cpu-lightning.Dockerfile -o cpu-lightning.sqsh
# Its base is made by containers/bases/debian-bookworm.sh (debootstrap, ~45 s).
# KIT lines are kit's own steps (docker stops at them): `KIT pip` installs with the
# host's pip into the image's Python, `KIT runtime` adds kit's runtime at /opt/kit.
FROM rootfs:bases/debian-bookworm
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 PYTHONUNBUFFERED=1
KIT pip torch==2.13.0 lightning>=2.2 prometheus-client>=0.17 psutil>=5.9 nvidia-ml-py>=12 cloudpickle>=2
KIT runtime
WORKDIR /workspace
RUN python3 -c 'import torch, lightning, kit.train.main' && echo image-ok
