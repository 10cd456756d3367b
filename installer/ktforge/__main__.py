from ktforge.cli.commands import main

main()
