"""The docs blocks' shared interpreter: a fresh namespace per block, its output and failures its own."""

from __future__ import annotations

import os

from block_interpreter import BlockInterpreter


def test_blocks_share_a_process_but_not_a_namespace(tmp_path):
    interpreter = BlockInterpreter(dict(os.environ))
    try:
        first = interpreter.run("import os, sys\nx = 1\nprint(os.getpid(), sys.argv)\n", tmp_path, 60)
        assert first.error is None and first.stdout.split()[1:] == ["['-c']"]
        second = interpreter.run("import os\nprint(os.getpid())\nprint(x)\n", tmp_path, 60)
        assert second.stdout.split()[0] == first.stdout.split()[0]  # the same process
        assert "NameError: name 'x' is not defined" in second.error
        third = interpreter.run("import os\nos.write(2, b'from C')\nprint(__name__, open('f', 'w').name)\n",
                                tmp_path / "", 60)
        assert (third.error, third.stdout, third.stderr) == (None, "__main__ f\n", "from C")
        assert (tmp_path / "f").exists()
    finally:
        interpreter.close()


def test_a_block_that_ends_the_process_fails_alone(tmp_path):
    interpreter = BlockInterpreter(dict(os.environ))
    try:
        died = interpreter.run("import os, sys\nprint('bye', flush=True)\nos._exit(3)\n", tmp_path, 60)
        assert "the interpreter died (exit 3)" in died.error and died.stdout == "bye\n"
        assert interpreter.run("input()\n", tmp_path, 60).error.strip().endswith("EOFError: EOF when reading a line")
        assert "no reply in 1 s" in interpreter.run("import time\ntime.sleep(30)\n", tmp_path, 1).error
        assert interpreter.run("print(1)\n", tmp_path, 60) == interpreter.run("print(1)\n", tmp_path, 60)
    finally:
        interpreter.close()
