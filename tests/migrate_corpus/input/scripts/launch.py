import os
import subprocess

subprocess.run(["vf-eval", "my-env", "-a", '{"difficulty": "easy"}', "-n", "4", "-s"], check=True)
subprocess.run(["vf-eval", "reverse-text", "-n", "2"], check=True)
os.system("vf-eval my-env -b http://localhost:8000/v1 -k KEY")
