import os
import subprocess

subprocess.run(["vf-eval", "my-env", "--taskset.difficulty", "easy", "-n", "4"], check=True)
subprocess.run(["vf-eval", "reverse-text", "-n", "2"], check=True)
os.system("vf-eval my-env --base-url http://localhost:8000/v1 --api-key-var KEY")
