from het.cli import main

main()
