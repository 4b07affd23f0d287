"""`fastpath ... | head`: the CLI stops quietly when its reader goes away (no BrokenPipeError traceback)."""

import subprocess
import sys
import textwrap


def test_a_closed_stdout_pipe_ends_the_cli_quietly_with_sigpipe_status():
    code = textwrap.dedent("""
        import argparse
        from fastpath.cli import main as cli

        def flood(args):
            for index in range(200000):
                print(f"line {index}")
            return 0

        def parser():
            p = argparse.ArgumentParser(prog="fastpath")
            p.set_defaults(func=flood)
            return p

        cli.build_parser = parser
        raise SystemExit(cli.main([]))
    """)
    writer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert writer.stdout.readline() == b"line 0\n"
    writer.stdout.close()  # the reader goes away, like `head -1`
    _, stderr = writer.communicate(timeout=60)
    assert writer.returncode == 141, stderr.decode()
    assert b"Traceback" not in stderr and b"BrokenPipeError" not in stderr, stderr.decode()
