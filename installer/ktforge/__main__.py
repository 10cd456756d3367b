from ktforge.cli import main

main()
