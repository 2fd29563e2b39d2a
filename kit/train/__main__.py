from kit.train import preempt

preempt.install()  # before the slow imports: a warning may come at any time

from kit.train.main import main  # noqa: E402

raise SystemExit(main())
